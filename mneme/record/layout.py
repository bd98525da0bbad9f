"""The recorder's fixed address layout, importable without the record-DB schema (`mneme record` starts
the app before it loads the schema). Mirrors MN_DEFAULT_VA_BASE in native/recorder."""

#: where the recorder's device arena starts by default (replay reserves the same range)
DEFAULT_VADDR = 0x153940000000
