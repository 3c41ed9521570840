"""Benchmark scoring: answering from memory (:mod:`.answer`), the answer metrics
(:mod:`.metrics`), memgym's own judge and the scorer types (:mod:`.judge`), each benchmark's
official judge over its protocol file (:mod:`.official`, :mod:`.protocols`,
:mod:`.beam_judge`), the scorer factory (:mod:`.scorers`), the one result and summary
(:mod:`.summary`), the shared recipe fields (:mod:`.selection`), the report renderer
(:mod:`.report`), and the jobs that use them: ``memgym eval`` (:mod:`.evaluate`) and
``memgym score`` (:mod:`.predictions`). The RL reward built on them is the rest of
:mod:`rewards` (session reward, length, attribution, samples, audit)."""
