/* Run one command; write "<wall seconds> <peak RSS KiB>" of it to OUTFILE.
 *
 *   launcher OUTFILE PROGRAM [ARGS...]
 *
 * Why a C launcher: Linux carries a process's peak RSS across exec (exec_mmap records the old
 * mm's high-water mark), so a command started straight from the benchmark's Python process would
 * report at least that process's RSS. Started from this small process it reports its own peak
 * (getrusage(RUSAGE_CHILDREN) here: the command and the children it waited for, the largest one).
 * The wall time is taken around fork/exec/wait, as slurmd would see it. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s OUTFILE PROGRAM [ARGS...]\n", argv[0]);
        return 125;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 125;
    }
    if (pid == 0) {
        execv(argv[2], argv + 2);
        perror(argv[2]);
        _exit(127);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) < 0) {
        perror("waitpid");
        return 125;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    struct rusage usage;
    getrusage(RUSAGE_CHILDREN, &usage);
    FILE *out = fopen(argv[1], "w");
    if (!out) {
        perror(argv[1]);
        return 125;
    }
    fprintf(out, "%.6f %ld\n", (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9, usage.ru_maxrss);
    fclose(out);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return WEXITSTATUS(status);
}
