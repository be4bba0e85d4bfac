"""Serving past one process, on an existing distributed layer (never our own): Ray Serve
replicas of llmc engines behind llmc's own OpenAI app (``llmc.deploy.ray``)."""
