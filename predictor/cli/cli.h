/* cli.h - subcommands implemented outside main.c. */
#ifndef MM_CLI_H
#define MM_CLI_H
#include "cli_alloc.h"
#include "cli_import.h"
#include "cli_report.h"
#define mm_cli_report_entry(argc, argv) mm_cli_report((argc) - 1, (argv) + 1)
#endif
