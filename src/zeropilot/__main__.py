from zeropilot.cli import entry

entry()
