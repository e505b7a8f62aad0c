"""Tasks: data loading, prompts and TRL-style reward functions (installed as ``dllm_ais.tasks``).

One task per file (``gsm8k``, ``math500``, ``countdown``, ``sudoku``, ``arith``, ``digits``); ``registry.TASKS`` maps
names to ``base.Task`` records and ``registry.get_task(name)`` looks one up. Importing this package is light:
``datasets`` and ``math_verify`` are imported only inside the functions that need them.
"""
