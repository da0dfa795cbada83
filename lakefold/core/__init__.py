"""The bottom layer every other package stands on: the error hierarchy (``exceptions``), DSN
masking (``dsn``), Arrow reads through ADBC (``adbc``), lazy package exports (``lazy``) and the
store's schema migrations, which every package registers its tables with (``migrations``).

It imports nothing else of lakefold, and is kept free of settings and services.
"""
