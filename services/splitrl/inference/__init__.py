"""The inference service (cloud): batches edge streams, runs the policy, writes trajectories to replay."""
