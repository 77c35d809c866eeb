"""python -m service … is the `neardup` command."""

from .cli import main

raise SystemExit(main())
