"""`python -m tinygrad_attn COMMAND ...`: see tinygrad_attn/cli.py."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m tinygrad_attn"))
