"""Examples: hook services and clients in other languages."""
