#!/usr/bin/env python
"""Django's command-line utility for the example project (example_project/proj)."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main() -> None:
    """Run a management command with ``example_project/`` on the path."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "example_project"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
