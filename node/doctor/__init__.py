"""`prime-node doctor`: is this machine ready to work for a pool? Checked before any stake is at risk.

Each check measures one thing and returns a `CheckResult`: a status (ok, warn, fail, skip), one line with the
measured value, and for warn and fail the line that fixes it. The checks, in order:

    python -> torch -> gpu -> vllm -> memory -> model -> disk -> docker -> ports -> chain -> sources -> self-test

The last one runs the worker's real path end to end on the embedded tiny model: generate a rollout file with
TOPLOC proofs (`engine.generate`, as `prime-node generate` does), then hand it to the validator's own command,
`python -m validator.cli file`, in a child process. A child process, not an import: imports point
`ledger <- node <- validator` (DESIGN section 2), so node may not import validator; and a fresh process that
loads the checkpoint from disk is what a real validator does, so nothing the worker holds in memory can make a
bad file pass. A machine whose files its own validator rejects would be slashed; this is where it finds out.

A check never raises: the runner turns an unexpected exception into a failed check that names it, so one broken
probe cannot hide the others.
"""
