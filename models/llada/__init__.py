"""LLaDA (GSAI-ML/LLaDA-8B-Instruct): bidirectional masked diffusion, unshifted logits. The family's record is
family.py; the masked-diffusion sampler (samplers/diffusion.py) and path likelihood (likelihood/trajectory.py) it
uses are the package's shared ones."""
