"""The tasks: for each kind of model, how it is wrapped and exported (``export``) and how its file is run (``run``); the registry in ``registry``."""
