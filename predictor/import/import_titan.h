/* import_titan.h (layer import) - torchtitan's job config: the tables that
 * map to spec keys (import_titan.c), read by import_titan_rules.c. */
#ifndef MM_IMPORT_TITAN_H
#define MM_IMPORT_TITAN_H

#include "import_rd.h"

int imp_titan_model(imp_job *j, hfc *h);
int imp_titan_training(imp_job *j, hfc *h);
int imp_titan_parallel(imp_job *j, hfc *h);
int imp_titan_ac(imp_job *j, hfc *h);
int imp_titan_optimizer(imp_job *j, hfc *h);

#endif
