"""Benchmark scoring: answering from memory, answer metrics, judges (memgym's and each
benchmark's official protocol), the one result/summary, recipe fields, reports, and the
``memgym eval`` / ``memgym score`` jobs.
"""
