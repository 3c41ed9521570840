"""The search layer of evolution: WHICH program to try next (PrisMem Algorithm 1).

archive (candidates, base, specialists, lineage), select (target / parent / case policies),
cases (compact diagnostic cases), edits (SEARCH/REPLACE application), proposers (coder,
params, scripted), ledger (tokens and budgets per role), loop (cold start → capability
refinement → [integration hook] → frozen final), report. Imports :mod:`evolution.execution`,
never the other way.
"""
