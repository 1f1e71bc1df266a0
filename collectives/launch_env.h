// launch_env: torchrun's variables from whichever launcher started this process, so that
// every dtr program runs under torchrun or dtrrun, Slurm's srun and an MPI launcher alike.
//
// torchrun and dtrrun set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT; where RANK is absent they are derived from:
//   srun (Slurm)  SLURM_PROCID, SLURM_STEP_NUM_TASKS (else SLURM_NTASKS), SLURM_LOCALID,
//                 SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE, "2(x3),1") at
//                 SLURM_NODEID; MASTER_ADDR the first host of SLURM_STEP_NODELIST (else
//                 SLURM_NODELIST: "node[07-09],gpu1" -> node07), MASTER_PORT if set, else
//                 15000 + SLURM_JOB_ID % 20000 (every task of a job derives the same port)
//   Open MPI      OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
//   MPICH, Intel  PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
// An MPI launcher knows no rendezvous address: MASTER_ADDR and MASTER_PORT must come with
// it (mpirun -x MASTER_ADDR=... -x MASTER_PORT=...), else a ValueError says so.
#pragma once

#include <functional>
#include <map>
#include <string>

namespace dtr {

// A launcher's environment: name -> value, nullptr when unset.
using EnvLookup = std::function<const char*(const char*)>;

// torchrun's variables derived from `env` (empty when RANK is already set or no known
// launcher's variables are there), and the launcher they came from ("slurm", "openmpi",
// "pmi"; "" for none). ValueError for a launcher's variables that do not parse, or an MPI
// launch without MASTER_ADDR and MASTER_PORT.
struct LauncherEnv {
  std::string launcher;
  std::map<std::string, std::string> variables;
};
LauncherEnv torchrun_env_from(const EnvLookup& env);

// Sets in this process (for it and its children) what torchrun_env_from(getenv) derives.
void adopt_launcher_env();

// The first host of a Slurm hostlist: "node[07-09,12],gpu1" -> "node07".
std::string first_slurm_host(const std::string& hostlist);

}  // namespace dtr
