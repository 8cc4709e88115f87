"""The learner service (cloud): samples replay, trains the actor-critic, publishes weights."""
