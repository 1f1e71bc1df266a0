// launch_env: torchrun's variables derived from faked Slurm, Open MPI and MPICH/Intel MPI
// environments (no scheduler needed): ranks, sizes, the first host of Slurm hostlists, the
// port derived from the job id, tasks per node in Slurm's compressed form, and the errors
// for an MPI launch without a rendezvous address and for values that do not parse. The train
// program under faked srun and mpirun ranks is tests/train/train_test.cc's.
#include "collectives/launch_env.h"

#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "core/error.h"
#include "tests/testing/test_util.h"

namespace dtr {
namespace {

using testing::MessageContains;
using Vars = std::map<std::string, std::string>;

LauncherEnv derive(const Vars& env) {
  return torchrun_env_from([&](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST_CASE("Slurm hostlists: the first host, zero padding kept", "[launch_env]") {
  CHECK(first_slurm_host("localhost") == "localhost");
  CHECK(first_slurm_host("n1,n2") == "n1");
  CHECK(first_slurm_host("node[07-09,12],gpu1") == "node07");
  CHECK(first_slurm_host("node[3,5]") == "node3");
  CHECK(first_slurm_host("rack[1-2]-ib,other") == "rack1-ib");
  CHECK_THROWS_MATCHES(first_slurm_host("node[1-2"), ValueError, MessageContains("unclosed '['"));
}

TEST_CASE("srun: rank, world, local rank and size, master host and port", "[launch_env]") {
  const Vars slurm = {{"SLURM_PROCID", "5"},
                      {"SLURM_NTASKS", "7"},
                      {"SLURM_LOCALID", "1"},
                      {"SLURM_NODEID", "2"},
                      {"SLURM_JOB_ID", "123456"},
                      {"SLURM_NODELIST", "gpu[03-05]"},
                      {"SLURM_TASKS_PER_NODE", "2(x3),1"}};
  const LauncherEnv e = derive(slurm);
  CHECK(e.launcher == "slurm");
  CHECK(e.variables == Vars{{"RANK", "5"},
                            {"WORLD_SIZE", "7"},
                            {"LOCAL_RANK", "1"},
                            {"LOCAL_WORLD_SIZE", "2"},
                            {"MASTER_ADDR", "gpu03"},
                            {"MASTER_PORT", std::to_string(15000 + 123456 % 20000)}});
  // The step's own figures win over the job's; MASTER_ADDR and MASTER_PORT given stay.
  Vars step = slurm;
  step["SLURM_STEP_NUM_TASKS"] = "4";
  step["SLURM_STEP_NODELIST"] = "cpu9,cpu10";
  step["SLURM_STEP_TASKS_PER_NODE"] = "1,3";
  step["SLURM_NODEID"] = "1";
  step["MASTER_PORT"] = "29400";
  const LauncherEnv s = derive(step);
  CHECK(s.variables.at("WORLD_SIZE") == "4");
  CHECK(s.variables.at("LOCAL_WORLD_SIZE") == "3");
  CHECK(s.variables.at("MASTER_ADDR") == "cpu9");
  CHECK_FALSE(s.variables.contains("MASTER_PORT"));

  Vars no_job = slurm;
  no_job.erase("SLURM_JOB_ID");
  CHECK_THROWS_MATCHES(derive(no_job), ValueError, MessageContains("export MASTER_PORT"));
  Vars bad = slurm;
  bad["SLURM_PROCID"] = "x1";
  CHECK_THROWS_MATCHES(derive(bad), ValueError, MessageContains("SLURM_PROCID=\"x1\" is not a whole number"));
}

TEST_CASE("mpirun: Open MPI's and PMI's variables, MASTER_ADDR and MASTER_PORT required", "[launch_env]") {
  const Vars ompi = {
      {"OMPI_COMM_WORLD_RANK", "3"},       {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"MASTER_ADDR", "host0"},      {"MASTER_PORT", "29500"}};
  const LauncherEnv o = derive(ompi);
  CHECK(o.launcher == "openmpi");
  CHECK(o.variables == Vars{{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}});
  const LauncherEnv p = derive({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
  CHECK(p.launcher == "pmi");
  CHECK(p.variables == Vars{{"RANK", "0"}, {"WORLD_SIZE", "2"}});
  Vars no_master = ompi;
  no_master.erase("MASTER_ADDR");
  CHECK_THROWS_MATCHES(derive(no_master), ValueError,
                       MessageContains("launched by MPI (OMPI_COMM_WORLD_RANK=3 of 4) without MASTER_ADDR and "
                                       "MASTER_PORT") &&
                           MessageContains("mpirun -x MASTER_ADDR="));
}

TEST_CASE("torchrun's RANK, or no launcher at all, derives nothing", "[launch_env]") {
  CHECK(derive({{"RANK", "0"}, {"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}}).variables.empty());
  const LauncherEnv none = derive({{"HOME", "/root"}});
  CHECK(none.launcher.empty());
  CHECK(none.variables.empty());
}

}  // namespace
}  // namespace dtr
