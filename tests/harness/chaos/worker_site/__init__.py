"""A folder for the ``PYTHONPATH`` of the harness's Spark drivers: its ``sitecustomize``
makes their Python workers start faster (see that module; :mod:`tests.harness.chaos.jvm`
puts the folder there)."""
