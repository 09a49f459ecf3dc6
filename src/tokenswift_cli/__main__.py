"""`python -m tokenswift_cli` is the `tokenswift` command."""

from .cli import main

if __name__ == "__main__":
    main()
