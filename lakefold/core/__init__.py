"""The bottom layer every other package stands on: the error hierarchy (``exceptions``), DSN
masking (``dsn``), Arrow reads through ADBC (``adbc``) and lazy package exports (``lazy``).

It imports nothing else of lakefold, and is kept free of settings and services.
"""
