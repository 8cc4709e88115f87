"""Shared layer: everything more than one service needs."""
