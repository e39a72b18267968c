"""Tests of the canary package."""
