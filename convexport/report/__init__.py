"""The report: its fields typed once (types.py), its JSON Schema (schema.py), the words and
numbers both front ends say (words.py), the sections (sections.py) the terminal (terminal.py)
and the HTML page (html.py) render."""
