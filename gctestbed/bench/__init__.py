"""Benchmarks: commands that measure on this machine, print a table and return JSON-able rows."""
