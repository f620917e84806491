"""`neuronabox perf`: nccl-tests' benchmark loop over an emulated world (`ladder`: the request,
`worker`: the loop in each real rank, `expect`: what the data policy predicts, `run`:
the job and its rows, `table`: nccl-tests' table)."""
