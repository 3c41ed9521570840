"""The evaluation jobs: ``memgym eval`` (:mod:`.eval_job`: the bank program over extractor
columns) and ``memgym program eval`` (:mod:`.program_eval`: one program file, validated, with
diagnostics). Both run programs through :mod:`memgym.evolution.execution` (the sandboxed,
stage-cached runner, also evolve's) and score with :mod:`memgym.rewards.scoring`; they sit above
the runner because the runner sits above scoring (``evolution -> rewards``), and they import nothing
of :mod:`memgym.evolution.search`.
"""
