"""HookBus benchmarks: ``python -m bench`` runs them all."""
