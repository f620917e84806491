"""The launcher: the job description, torchrun's flags, process orchestration and reaping,
NCCL's pins and the rig, and the Python API."""
