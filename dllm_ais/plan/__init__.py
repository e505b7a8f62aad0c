"""`dllm-ais plan`: peak memory per GPU by part and seconds per RL step of a preset, before a run.

Built from meta-device models (no weights, nothing downloaded) and the measured rows under benchmarks/gpu/ (else
datasheet figures). Modules, one concept each: shape (the model, counted on the meta device), workload (what one step
runs), memory (bytes by part), flops (FLOPs by pass), rates (FLOP/s and bandwidth with their source), predict (a Plan,
its fixes and speed-ups), report (text and JSON), quick (predictions for scripts/gpu_check.sh --quick), command (the
subcommand), live_bytes (the measurement the tests hold the predictions against). Importing this package imports no
torch; docs/plan.md describes the model, its assumptions and its validated bounds.
"""

from .predict import Plan, fixes, make_plan
from .quick import predict_quick
from .report import format_plan, plan_dict

__all__ = ["Plan", "fixes", "format_plan", "make_plan", "plan_dict", "predict_quick"]
