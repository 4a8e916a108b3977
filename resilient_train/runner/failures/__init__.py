"""Failures inside a worker: deterministic recipe errors explained (``diagnose``) and deterministic
fault injection for tests and the chaos suite (``faults``).
"""
