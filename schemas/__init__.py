"""Pydantic models of the wire formats the gateway accepts and emits."""
