"""The built-in rule files (*.yaml), installed as the package data of convexport.builtin_rules."""
