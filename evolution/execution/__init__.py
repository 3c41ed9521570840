"""The execution layer of evolution: how ONE memory program runs and is measured (sandbox,
validation, component diff, the stage-cached runner and its cache, diagnostics,
:func:`~memgym.evolution.execution.runner.evaluate_program`). Nothing here imports
:mod:`memgym.evolution.search`; the ``memgym eval`` / ``program eval`` jobs are in
:mod:`memgym.evolution.evaluation`.
"""
