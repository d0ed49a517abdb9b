/* cli: the strata subcommands. Each takes the arguments after its name (argv[0] is the
 * subcommand) and returns the process exit code; only these functions print to the user. */
#ifndef STRATA_CLI_H
#define STRATA_CLI_H

int cmd_inspect(int argc, char **argv);       /* cli/inspect.c */
int cmd_gen(int argc, char **argv);           /* cli/gen.c */
int cmd_info(int argc, char **argv);          /* cli/info.c */
int cmd_bench_kernels(int argc, char **argv); /* cli/bench_kernels.c */
int cmd_run(int argc, char **argv);           /* cli/run.c */
int cmd_chat(int argc, char **argv);          /* cli/chat.c */
int cmd_batch(int argc, char **argv);         /* cli/batch.c */
int cmd_serve(int argc, char **argv);         /* cli/serve.c */
int cmd_spec_replay(int argc, char **argv);   /* cli/spec_replay.c */
int cmd_bench(int argc, char **argv);         /* cli/bench.c */
int cmd_stats_routing(int argc, char **argv); /* cli/stats_routing.c */
int cmd_convert(int argc, char **argv);       /* cli/convert.c */
int cmd_logits(int argc, char **argv);        /* cli/logits.c */
int cmd_profile(int argc, char **argv);       /* cli/profile.c */

/* Prints "strata: <what>: <err_msg()>" to stderr and returns 1. */
int cli_fail(const char *what);

/* After a failed strata_open / strata_load / strata_start: cli_fail with the step that failed
 * ("loading the model", "--bind", "copying the weights", "starting the engine"). */
int cli_open_fail(void);

#endif
