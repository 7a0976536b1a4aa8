from aiworker.cli import run

run()
