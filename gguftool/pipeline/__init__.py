"""plan -> read -> (convert) -> quantize -> write -> validate. Progress bars live here."""
