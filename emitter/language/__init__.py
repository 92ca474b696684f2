"""The sugar: the reader (text → Program), the Program IR, names and the error every refusal raises."""
