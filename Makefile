.PHONY: engine

# The CPU vLLM engine (own venv under .engine/) and the tiny local model it serves.
# Idempotent: a second run only checks its stamps.
engine:
	scripts/engine-setup.sh
