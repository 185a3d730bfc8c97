"""Behavioural audits of generating readers (SPEC §8)."""
