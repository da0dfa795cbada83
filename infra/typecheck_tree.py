"""Link the source folders into .typecheck/lakefold so mypy sees the one `lakefold` namespace.

pyproject's package-dir maps top-level folders (capture/, spark/, ...) to lakefold.* at install
time; mypy cannot follow that mapping, so it type-checks this mirror of links instead.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUBPACKAGES = ["capture", "eventstore", "projections", "spark", "schemas"]


def main() -> None:
    tree = ROOT / ".typecheck" / "lakefold"
    tree.mkdir(parents=True, exist_ok=True)
    for link in tree.iterdir():
        if link.is_symlink():
            link.unlink()
    for source in (ROOT / "lakefold").iterdir():
        if source.suffix in {".py", ".typed"} or (source.is_dir() and source.name != "__pycache__"):
            (tree / source.name).symlink_to(source)
    for name in SUBPACKAGES:
        (tree / name).symlink_to(ROOT / name)


if __name__ == "__main__":
    main()
