"""`python -m tokenswift_cli` is the `tokenswift` command."""

from tokenswift_cli.cli.app import main

if __name__ == "__main__":
    main()
