"""Example hook services (see docs/writing-hooks.md)."""
