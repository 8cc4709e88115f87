"""The environment service (edge): steps N gymnasium envs and streams their frames to the edge-encoder."""
