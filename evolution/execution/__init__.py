"""The execution layer of evolution: how ONE memory program runs and is measured.

sandbox (+ sandbox_child): a program in a limited subprocess; validate: the four levels;
component_diff: AST component hashes and the earliest invalidated stage; stages + runner: the
stage-cached extract → index → plan → retrieve → answer → score pipeline; diagnostics:
d_ext/d_idx/d_ret; program_eval: ``memgym program eval``. Nothing here imports
:mod:`evolution.search` (imports run search → execution).
"""
