"""The Hub side: the Hub calls, push, pull, the model card and the local Hub-compatible server."""
