/* cli_report.h - `mmguard report LOG...`: summary of decision logs
 * (docs/report.md).  The summarising logic is in report.c (library). */
#ifndef MM_CLI_REPORT_H
#define MM_CLI_REPORT_H

/* argv[0] == "report".  Exit status: 0 ok (malformed lines are reported, not
 * fatal), 1 a log could not be read or out of memory, 2 usage error. */
int mm_cli_report(int argc, char **argv);

#endif
