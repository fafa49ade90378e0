/* dur_worker.c - one worker process of the durability workload (SGD
 * witness and Adagrad pushes counted in shared memory), exec'd by
 * dur_worker_spawn (dur_util.h) so that it starts clean of the test's
 * threads and their locks. */
#include "dur_util.h"

int main(int argc, char **argv) { return dur_worker_main(argc, argv); }
