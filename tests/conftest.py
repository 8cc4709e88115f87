"""Shared test set-up: tests run single-threaded torch so two cores stay enough."""

import torch

torch.set_num_threads(1)
