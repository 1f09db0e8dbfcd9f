// Launcher detection from map-backed variables and files: each launcher, their precedence,
// every class of bad input, and the Slurm hostlist and hostfile formats.

#include "apps/cli/launch_environment.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

namespace troupe::apps {
namespace {

using variables = std::map<std::string, std::string>;
using files = std::map<std::string, std::string>;

variable_lookup lookup(const variables& values) {
  return [values](const std::string& name) -> std::optional<std::string> {
    const auto found = values.find(name);
    if (found == values.end()) return std::nullopt;
    return found->second;
  };
}

file_reader reader(const files& contents) {
  return [contents](const std::string& path, std::string* error) -> std::optional<std::string> {
    const auto found = contents.find(path);
    if (found != contents.end()) return found->second;
    *error = "no such file";
    return std::nullopt;
  };
}

/// Detects from `values` and `contents`, failing the test on an error.
launch_environment detect(const variables& values, const files& contents = {}) {
  std::string error;
  const auto environment = detect_launch_environment(lookup(values), reader(contents), &error);
  EXPECT_TRUE(environment.has_value()) << error;
  return environment.value_or(launch_environment{});
}

/// The error that detection from `values` and `contents` reports; fails the test on success.
std::string detect_error(const variables& values, const files& contents = {}) {
  std::string error;
  const auto environment = detect_launch_environment(lookup(values), reader(contents), &error);
  EXPECT_FALSE(environment.has_value()) << "launcher " << environment->launcher;
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  return error;
}

std::string hostlist_error(const std::string& list) {
  std::string error;
  EXPECT_FALSE(expand_hostlist(list, &error).has_value()) << list;
  return error;
}

std::string hostfile_error(const std::string& text) {
  std::string error;
  EXPECT_FALSE(read_hostfile(text, "hosts.txt", &error).has_value()) << text;
  return error;
}

const variables slurm_step = {{"SLURM_PROCID", "3"},
                              {"SLURM_NTASKS", "5"},
                              {"SLURM_LOCALID", "1"},
                              {"SLURM_JOB_NODELIST", "n[1-3]"},
                              {"SLURM_TASKS_PER_NODE", "2(x2),1"}};

variables with(variables values, const variables& more) {
  for (const auto& [name, value] : more) values[name] = value;
  return values;
}

TEST(LaunchEnvironmentTest, NoLauncherIsRankZeroOfOne) {
  const auto environment = detect({{"MASTER_PORT", "not a port"}, {"RANK", "2"}});
  EXPECT_EQ(environment.launcher, "none");
  EXPECT_EQ(environment.rank, 0);
  EXPECT_EQ(environment.world_size, 1);
  EXPECT_EQ(environment.local_rank, 0);
  EXPECT_EQ(environment.coordinator_host, "");
  EXPECT_EQ(environment.coordinator_port, 0);
  EXPECT_TRUE(environment.hosts.empty());
}

TEST(LaunchEnvironmentTest, TorchrunReadsRanksAndMaster) {
  const auto environment = detect({{"RANK", "5"},
                                   {"WORLD_SIZE", "8"},
                                   {"LOCAL_RANK", "1"},
                                   {"MASTER_ADDR", "node0"},
                                   {"MASTER_PORT", "29500"}});
  EXPECT_EQ(environment.launcher, "torchrun");
  EXPECT_EQ(environment.rank, 5);
  EXPECT_EQ(environment.world_size, 8);
  EXPECT_EQ(environment.local_rank, 1);
  EXPECT_EQ(environment.coordinator_host, "node0");
  EXPECT_EQ(environment.coordinator_port, 29500);
  EXPECT_TRUE(environment.hosts.empty());
}

TEST(LaunchEnvironmentTest, TorchrunWinsOverSlurmAndMpi) {
  const auto environment = detect(
      with(slurm_step, {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"PMI_RANK", "1"}, {"PMI_SIZE", "4"}}));
  EXPECT_EQ(environment.launcher, "torchrun");
  EXPECT_EQ(environment.world_size, 2);
}

TEST(LaunchEnvironmentTest, SlurmMapsRanksToNodesByTasksPerNode) {
  const auto environment = detect(with(slurm_step, {{"TROUPE_COORDINATOR_PORT", "7000"}}));
  EXPECT_EQ(environment.launcher, "slurm");
  EXPECT_EQ(environment.rank, 3);
  EXPECT_EQ(environment.world_size, 5);
  EXPECT_EQ(environment.local_rank, 1);
  EXPECT_EQ(environment.hosts, (host_names{"n1", "n1", "n2", "n2", "n3"}));
  EXPECT_EQ(environment.coordinator_host, "n1");
  EXPECT_EQ(environment.coordinator_port, 7000);
}

TEST(LaunchEnvironmentTest, SlurmCountsLocalRankWhenLocalIdIsMissing) {
  variables values = slurm_step;
  values.erase("SLURM_LOCALID");
  values["SLURM_PROCID"] = "4";
  EXPECT_EQ(detect(values).local_rank, 0);
  values["SLURM_PROCID"] = "1";
  EXPECT_EQ(detect(values).local_rank, 1);
}

TEST(LaunchEnvironmentTest, SlurmCyclicDistributionDealsRanksRoundRobin) {
  const auto environment = detect(with(slurm_step, {{"SLURM_DISTRIBUTION", "cyclic:block"}}));
  EXPECT_EQ(environment.hosts, (host_names{"n1", "n2", "n3", "n1", "n2"}));
  EXPECT_EQ(environment.coordinator_host, "n1");
}

TEST(LaunchEnvironmentTest, SlurmPlaneAndArbitraryDistributionsLeaveHostsUnknown) {
  const auto plane = detect(with(slurm_step, {{"SLURM_DISTRIBUTION", "plane=2"}}));
  EXPECT_TRUE(plane.hosts.empty());
  EXPECT_EQ(plane.coordinator_host, "n1");
  const auto arbitrary = detect(with(slurm_step, {{"SLURM_DISTRIBUTION", "arbitrary"}}));
  EXPECT_TRUE(arbitrary.hosts.empty());
  EXPECT_EQ(arbitrary.coordinator_host, "");
}

TEST(LaunchEnvironmentTest, SlurmPrefersTheStepsNodesToTheJobs) {
  const auto environment = detect(
      with(slurm_step, {{"SLURM_STEP_NODELIST", "n[2-3]"}, {"SLURM_STEP_TASKS_PER_NODE", "3,2"}}));
  EXPECT_EQ(environment.hosts, (host_names{"n2", "n2", "n2", "n3", "n3"}));
  EXPECT_EQ(environment.coordinator_host, "n2");
}

TEST(LaunchEnvironmentTest, SlurmReadsNprocsAndNodelistFallbacks) {
  const auto environment = detect({{"SLURM_PROCID", "1"},
                                   {"SLURM_NPROCS", "2"},
                                   {"SLURM_NODELIST", "gpu[07-08]"},
                                   {"SLURM_TASKS_PER_NODE", "1(x2)"},
                                   {"MASTER_PORT", "29501"}});
  EXPECT_EQ(environment.hosts, (host_names{"gpu07", "gpu08"}));
  EXPECT_EQ(environment.local_rank, 0);
  EXPECT_EQ(environment.coordinator_port, 29501);
}

TEST(LaunchEnvironmentTest, SlurmWithoutTasksPerNodeKnowsOnlyTheCoordinator) {
  const auto environment =
      detect({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_JOB_NODELIST", "a,b"}});
  EXPECT_TRUE(environment.hosts.empty());
  EXPECT_EQ(environment.coordinator_host, "a");
}

TEST(LaunchEnvironmentTest, OpenMpiTakesTheCoordinatorFromTroupeCoordinator) {
  const auto environment = detect({{"OMPI_COMM_WORLD_RANK", "2"},
                                   {"OMPI_COMM_WORLD_SIZE", "4"},
                                   {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                   {"TROUPE_COORDINATOR", "head:6000"},
                                   {"MASTER_ADDR", "ignored"},
                                   {"MASTER_PORT", "1"}});
  EXPECT_EQ(environment.launcher, "openmpi");
  EXPECT_EQ(environment.rank, 2);
  EXPECT_EQ(environment.world_size, 4);
  EXPECT_EQ(environment.coordinator_host, "head");
  EXPECT_EQ(environment.coordinator_port, 6000);
}

TEST(LaunchEnvironmentTest, MpichTakesTheCoordinatorFromMasterAddr) {
  const auto environment = detect({{"PMI_RANK", "1"},
                                   {"PMI_SIZE", "3"},
                                   {"MPI_LOCALRANKID", "1"},
                                   {"MASTER_ADDR", "10.0.0.1"},
                                   {"MASTER_PORT", "29500"}});
  EXPECT_EQ(environment.launcher, "mpich");
  EXPECT_EQ(environment.local_rank, 1);
  EXPECT_EQ(environment.coordinator_host, "10.0.0.1");
  EXPECT_EQ(environment.coordinator_port, 29500);
}

TEST(LaunchEnvironmentTest, PmixReadsItsRankAndOpenMpisSize) {
  const auto environment = detect({{"PMIX_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
  EXPECT_EQ(environment.launcher, "pmix");
  EXPECT_EQ(environment.rank, 3);
  EXPECT_EQ(environment.world_size, 4);
  EXPECT_EQ(detect({{"PMIX_RANK", "3"}}).launcher, "none");
}

TEST(LaunchEnvironmentTest, MpiWithoutCoordinatorLeavesTheHostEmpty) {
  const auto environment = detect({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}});
  EXPECT_EQ(environment.coordinator_host, "");
  EXPECT_EQ(environment.coordinator_port, 0);
  EXPECT_EQ(environment.local_rank, 0);
}

TEST(LaunchEnvironmentTest, MpiTakesHostsFromTroupeHostfile) {
  const auto environment = detect({{"OMPI_COMM_WORLD_RANK", "2"},
                                   {"OMPI_COMM_WORLD_SIZE", "3"},
                                   {"TROUPE_HOSTFILE", "/jobs/hosts"}},
                                  {{"/jobs/hosts", "a slots=2\nb\n"}});
  EXPECT_EQ(environment.hosts, (host_names{"a", "a", "b"}));
  EXPECT_EQ(environment.coordinator_host, "a");
  EXPECT_EQ(environment.local_rank, 0);
}

TEST(LaunchEnvironmentTest, MpirunInsideSlurmAllocationKeepsMpiRanks) {
  // mpirun's daemons are Slurm tasks, one per node: their SLURM_PROCID is a node index.
  const auto environment = detect(with(slurm_step, {{"SLURM_PROCID", "1"},
                                                    {"SLURM_NTASKS", "3"},
                                                    {"SLURM_TASKS_PER_NODE", "1(x3)"},
                                                    {"OMPI_COMM_WORLD_RANK", "4"},
                                                    {"OMPI_COMM_WORLD_SIZE", "6"}}));
  EXPECT_EQ(environment.launcher, "openmpi");
  EXPECT_EQ(environment.rank, 4);
  EXPECT_EQ(environment.world_size, 6);
  EXPECT_TRUE(environment.hosts.empty());
}

TEST(LaunchEnvironmentTest, SrunWithMpiPluginKeepsSlurmHosts) {
  const auto environment =
      detect(with(slurm_step, {{"PMIX_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "5"}}));
  EXPECT_EQ(environment.launcher, "slurm");
  EXPECT_EQ(environment.hosts.size(), 5u);
}

TEST(LaunchEnvironmentTest, HostfileLauncherReadsFileAndRank) {
  const auto environment =
      detect({{"TROUPE_HOSTFILE", "hosts"}, {"TROUPE_RANK", "2"}, {"MASTER_PORT", "4000"}},
             {{"hosts", "# cluster\nalpha slots=2\nbeta:2\n"}});
  EXPECT_EQ(environment.launcher, "hostfile");
  EXPECT_EQ(environment.rank, 2);
  EXPECT_EQ(environment.world_size, 4);
  EXPECT_EQ(environment.local_rank, 0);
  EXPECT_EQ(environment.hosts, (host_names{"alpha", "alpha", "beta", "beta"}));
  EXPECT_EQ(environment.coordinator_host, "alpha");
  EXPECT_EQ(environment.coordinator_port, 4000);
}

TEST(LaunchEnvironmentTest, HostfileLauncherReadsFromDisk) {
  const std::string path = std::filesystem::temp_directory_path() /
                           ("troupe_hosts_" + std::to_string(::getpid()) + ".txt");
  std::ofstream(path) << "h1 slots=1\nh2 slots=1\n";
  std::string error;
  const auto environment =
      detect_launch_environment(lookup({{"TROUPE_HOSTFILE", path}, {"TROUPE_RANK", "1"}}), &error);
  std::remove(path.c_str());
  ASSERT_TRUE(environment.has_value()) << error;
  EXPECT_EQ(environment->hosts, (host_names{"h1", "h2"}));
  EXPECT_FALSE(
      detect_launch_environment(lookup({{"TROUPE_HOSTFILE", path}, {"TROUPE_RANK", "0"}}), &error));
  EXPECT_NE(error.find(path), std::string::npos) << error;
}

TEST(LaunchEnvironmentTest, TroupeCoordinatorAcceptsIpv6AndOverridesSlurm) {
  EXPECT_EQ(detect(with(slurm_step, {{"TROUPE_COORDINATOR", "[fe80::1]:7000"}})).coordinator_host,
            "fe80::1");
  const auto bare = detect(with(slurm_step, {{"TROUPE_COORDINATOR", "fe80::1"}}));
  EXPECT_EQ(bare.coordinator_host, "fe80::1");
  EXPECT_EQ(bare.coordinator_port, 0);
  const auto named =
      detect(with(slurm_step, {{"TROUPE_COORDINATOR", "ib-n1"}, {"MASTER_PORT", "9"}}));
  EXPECT_EQ(named.coordinator_host, "ib-n1");
  EXPECT_EQ(named.coordinator_port, 9);
}

TEST(LaunchEnvironmentTest, NonIntegerRankNamesTheVariable) {
  EXPECT_EQ(detect_error({{"RANK", "one"}, {"WORLD_SIZE", "2"}}),
            "RANK='one' is not a non-negative integer");
  EXPECT_EQ(detect_error({{"PMI_RANK", "-1"}, {"PMI_SIZE", "2"}}),
            "PMI_RANK='-1' is not a non-negative integer");
  EXPECT_EQ(detect_error(with(slurm_step, {{"SLURM_LOCALID", "1.5"}})),
            "SLURM_LOCALID='1.5' is not a non-negative integer");
}

TEST(LaunchEnvironmentTest, RankMustBeBelowWorldSize) {
  EXPECT_EQ(detect_error({{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}}),
            "OMPI_COMM_WORLD_RANK='4' is not less than OMPI_COMM_WORLD_SIZE='4'");
  EXPECT_EQ(detect_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}}),
            "LOCAL_RANK='2' is not less than WORLD_SIZE='2'");
}

TEST(LaunchEnvironmentTest, WorldSizeMustBePositive) {
  EXPECT_EQ(detect_error({{"RANK", "0"}, {"WORLD_SIZE", "0"}}),
            "WORLD_SIZE='0' is not a positive integer");
  EXPECT_EQ(detect_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", ""}}),
            "SLURM_NTASKS='' is not a positive integer");
}

TEST(LaunchEnvironmentTest, BadPortNamesTheVariable) {
  const variables torchrun = {{"RANK", "0"}, {"WORLD_SIZE", "1"}};
  EXPECT_EQ(detect_error(with(torchrun, {{"MASTER_PORT", "70000"}})),
            "MASTER_PORT='70000': port '70000' is not in 1-65535");
  EXPECT_EQ(detect_error(with(torchrun, {{"TROUPE_COORDINATOR_PORT", "0"}})),
            "TROUPE_COORDINATOR_PORT='0': port '0' is not in 1-65535");
  EXPECT_EQ(detect_error(with(torchrun, {{"TROUPE_COORDINATOR", "head:http"}})),
            "TROUPE_COORDINATOR='head:http': port 'http' is not in 1-65535");
  EXPECT_EQ(detect_error(with(torchrun, {{"TROUPE_COORDINATOR", ":80"}})),
            "TROUPE_COORDINATOR=':80' is not host[:port]");
}

TEST(LaunchEnvironmentTest, MalformedNodelistNamesTheVariable) {
  EXPECT_EQ(detect_error(with(slurm_step, {{"SLURM_JOB_NODELIST", "n[3-1]"}})),
            "SLURM_JOB_NODELIST: range '3-1' in hostlist 'n[3-1]' is descending");
}

TEST(LaunchEnvironmentTest, TasksPerNodeMustMatchTasksAndNodes) {
  EXPECT_EQ(detect_error(with(slurm_step, {{"SLURM_TASKS_PER_NODE", "2(x3)"}})),
            "SLURM_TASKS_PER_NODE='2(x3)' adds up to 6 tasks but SLURM_NTASKS='5'");
  EXPECT_EQ(detect_error(with(slurm_step, {{"SLURM_TASKS_PER_NODE", "4,1"}})),
            "SLURM_TASKS_PER_NODE='4,1' describes 2 nodes but SLURM_JOB_NODELIST='n[1-3]' has 3");
  EXPECT_EQ(detect_error(with(slurm_step, {{"SLURM_TASKS_PER_NODE", "2(x2,1"}})),
            "SLURM_TASKS_PER_NODE: '2(x2' in tasks per node '2(x2,1' is not N or N(xM) with "
            "positive N and M");
}

TEST(LaunchEnvironmentTest, HostfileLauncherErrorsNameTheFileOrVariable) {
  EXPECT_EQ(detect_error({{"TROUPE_HOSTFILE", "h"}}),
            "TROUPE_HOSTFILE is set but TROUPE_RANK is not");
  EXPECT_EQ(detect_error({{"TROUPE_RANK", "0"}}),
            "TROUPE_RANK is set but TROUPE_HOSTFILE is not; set both");
  EXPECT_EQ(detect_error({{"TROUPE_HOSTFILE", "gone"}, {"TROUPE_RANK", "0"}}),
            "TROUPE_HOSTFILE='gone': no such file");
  EXPECT_EQ(detect_error({{"TROUPE_HOSTFILE", "h"}, {"TROUPE_RANK", "2"}}, {{"h", "a:2\n"}}),
            "TROUPE_RANK='2' is not less than the 2 slots of TROUPE_HOSTFILE='h'");
  EXPECT_EQ(detect_error({{"TROUPE_HOSTFILE", "h"}, {"TROUPE_RANK", "0"}}, {{"h", "a slots=\n"}}),
            "TROUPE_HOSTFILE: h:1: slots value '' is not a positive integer");
  EXPECT_EQ(detect_error({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"TROUPE_HOSTFILE", "h"}},
                         {{"h", "a\n"}}),
            "TROUPE_HOSTFILE='h' has 1 slots but mpich started 2 ranks");
}

TEST(HostlistTest, ExpandsRangesAndListsKeepingZeroPadding) {
  EXPECT_EQ(expand_hostlist("n[01-04,07]", nullptr),
            (host_names{"n01", "n02", "n03", "n04", "n07"}));
}

TEST(HostlistTest, SplitsNamesAtCommasAndWhitespaceOutsideBrackets) {
  EXPECT_EQ(expand_hostlist("a,b", nullptr), (host_names{"a", "b"}));
  EXPECT_EQ(expand_hostlist(" a, b\tn[1,3] ", nullptr), (host_names{"a", "b", "n1", "n3"}));
}

TEST(HostlistTest, KeepsTextAfterBrackets) {
  EXPECT_EQ(expand_hostlist("n[1-3]x", nullptr), (host_names{"n1x", "n2x", "n3x"}));
}

TEST(HostlistTest, ExpandsSeveralBracketGroupsLeftmostSlowest) {
  EXPECT_EQ(expand_hostlist("rack[1-2]-n[01-02]", nullptr),
            (host_names{"rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"}));
}

TEST(HostlistTest, WidthComesFromTheRangesFirstBound) {
  EXPECT_EQ(expand_hostlist("n[01-4]", nullptr), (host_names{"n01", "n02", "n03", "n04"}));
  EXPECT_EQ(expand_hostlist("n[1-04]", nullptr), (host_names{"n1", "n2", "n3", "n4"}));
  EXPECT_EQ(expand_hostlist("n[9-11]", nullptr), (host_names{"n9", "n10", "n11"}));
  EXPECT_EQ(expand_hostlist("n[098-100]", nullptr), (host_names{"n098", "n099", "n100"}));
}

TEST(HostlistTest, RejectsEmptyBrackets) {
  EXPECT_EQ(hostlist_error("n[]"), "empty brackets '[]' in hostlist 'n[]'");
}

TEST(HostlistTest, RejectsDescendingRanges) {
  EXPECT_EQ(hostlist_error("n[3-1]"), "range '3-1' in hostlist 'n[3-1]' is descending");
}

TEST(HostlistTest, RejectsMalformedRangesAndBrackets) {
  for (const std::string list : {"n[a-b]", "n[1-]", "n[-1]", "n[1,]", "n[1-2-3]", "n[ 1]"}) {
    EXPECT_NE(hostlist_error(list).find("in hostlist '" + list + "' is not N or N-M"),
              std::string::npos)
        << list;
  }
  EXPECT_EQ(hostlist_error("n[1-3"), "hostlist 'n[1-3' does not close its last '['");
  EXPECT_EQ(hostlist_error("n1]"), "hostlist 'n1]' has ']' without '['");
  EXPECT_EQ(hostlist_error("n[1[2]]"), "hostlist 'n[1[2]]' nests '['");
  EXPECT_EQ(hostlist_error(" , "), "hostlist ' , ' names no hosts");
}

TEST(HostlistTest, RejectsExpansionsTooLargeToHold) {
  EXPECT_NE(hostlist_error("n[0-99999999]").find("too many hosts"), std::string::npos);
  EXPECT_NE(hostlist_error("a[0-9999]b[0-9999]").find("too many hosts"), std::string::npos);
}

TEST(TasksPerNodeTest, ExpandsRepeatsInOrder) {
  EXPECT_EQ(expand_tasks_per_node("2(x2),1", nullptr), (std::vector<int>{2, 2, 1}));
  EXPECT_EQ(expand_tasks_per_node("4", nullptr), (std::vector<int>{4}));
}

TEST(TasksPerNodeTest, RejectsMalformedEntries) {
  for (const std::string text : {"", "0", "2(x0)", "2(x2", "a", "2,,1", "(x2)", "2(x2)3"}) {
    std::string error;
    EXPECT_FALSE(expand_tasks_per_node(text, &error).has_value()) << text;
    EXPECT_NE(error.find("tasks per node '" + text + "'"), std::string::npos) << error;
  }
}

TEST(HostfileTest, ExpandsSlotsInFileOrder) {
  EXPECT_EQ(read_hostfile("a slots=2\nb slots=1\nc slots=3\n", "h", nullptr),
            (host_names{"a", "a", "b", "c", "c", "c"}));
}

TEST(HostfileTest, SkipsCommentsAndBlankLines) {
  EXPECT_EQ(read_hostfile("# header\n\n  a slots=2  # two GPUs\n\t\n#b\nc\n", "h", nullptr),
            (host_names{"a", "a", "c"}));
  EXPECT_EQ(read_hostfile("a slots=2\r\nb:1\r\n", "h", nullptr), (host_names{"a", "a", "b"}));
}

TEST(HostfileTest, MissingSlotsMeansOne) {
  EXPECT_EQ(read_hostfile("a\nb", "h", nullptr), (host_names{"a", "b"}));
}

TEST(HostfileTest, AcceptsMpichColonFormMaxSlotsAndIpv6) {
  EXPECT_EQ(read_hostfile("a:2\nb slots=1 max_slots=4\nfe80::1 slots=2\n", "h", nullptr),
            (host_names{"a", "a", "b", "fe80::1", "fe80::1"}));
}

TEST(HostfileTest, BadSlotsValueNamesTheLine) {
  EXPECT_EQ(hostfile_error("a slots=2\n\nb slots=x\n"),
            "hosts.txt:3: slots value 'x' is not a positive integer");
  EXPECT_EQ(hostfile_error("a slots=0"), "hosts.txt:1: slots value '0' is not a positive integer");
  EXPECT_EQ(hostfile_error("a\nb:two"), "hosts.txt:2: slot count 'two' is not a positive integer");
}

TEST(HostfileTest, RejectsUnknownFieldsRepeatsAndEmptyFiles) {
  EXPECT_EQ(hostfile_error("a cpus=4"), "hosts.txt:1: unknown field 'cpus=4' (expected slots=N)");
  EXPECT_EQ(hostfile_error("a:2 slots=2"), "hosts.txt:1: slots given twice");
  EXPECT_EQ(hostfile_error(":2"), "hosts.txt:1: no host name before ':'");
  EXPECT_EQ(hostfile_error("# nothing\n\n"), "hosts.txt lists no hosts");
  EXPECT_NE(hostfile_error("a slots=1048576\nb\n").find("hosts.txt:2: more than"),
            std::string::npos);
}

}  // namespace
}  // namespace troupe::apps
