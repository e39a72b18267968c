"""Mutation tests: a committed corpus of broken dumps, run through every command under guards."""
