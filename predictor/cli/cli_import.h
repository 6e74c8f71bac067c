/* cli_import.h - `mmguard import`. */
#ifndef MM_CLI_IMPORT_H
#define MM_CLI_IMPORT_H
int mm_cli_import(int argc, char **argv);
#endif
