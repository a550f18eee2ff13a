"""Paper 2 as one reproducible unit: the Slurm job graph (``graph``), the per-run study record
(``record``), the stages the jobs run (``stages``) and the report (``report``).
``examples/paper2_study.sh`` is the entry point; docs/study.md describes it."""
