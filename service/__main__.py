"""python -m neardup … is the `neardup` command."""

from .cli import main

if __name__ == "__main__":  # not when a signing helper process imports this module (spawn)
    raise SystemExit(main())
