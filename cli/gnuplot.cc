#include "cli/gnuplot.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "cli/print.h"

namespace gpumigrate::cli {

bool HaveGnuplot() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }

Status CheckPlotTarget(const std::string& png) {
  if (png.find_first_of("'\"\n\\") != std::string::npos) {
    return InvalidArgument(fmt::format("--plot {}: the file name may not contain a quote, a backslash or a newline",
                                       png));
  }
  const size_t slash = png.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : png.substr(0, slash);
  if (png.empty() || png.back() == '/') return InvalidArgument(fmt::format("--plot '{}': not a file name", png));
  if (access(dir.c_str(), W_OK) != 0) {
    return InvalidArgument(fmt::format("--plot {}: cannot write in {}: {}", png, dir, std::strerror(errno)));
  }
  if (!HaveGnuplot()) {
    return InvalidArgument(
        "--plot needs gnuplot, which is not installed (apt-get install gnuplot-nox); without --plot nothing else "
        "needs it");
  }
  return Status::Ok();
}

std::string GnuplotText(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

Status RunGnuplot(const std::string& script, const std::string& png) {
  char dir[] = "/tmp/gpumigrate-plot-XXXXXX";
  if (mkdtemp(dir) == nullptr) return Internal("--plot: cannot create a temporary directory");
  const std::string script_path = std::string(dir) + "/plot.gp";
  const std::string err_path = std::string(dir) + "/stderr";
  const std::string out_path = std::string(dir) + "/plot.png";
  // Drawn to a file of our own first: a failed drawing leaves `png` as it was.
  const std::string text = fmt::format("set output '{}'\n", out_path) + script;
  {
    std::ofstream f(script_path);
    f << text;
    if (!f) return Internal(fmt::format("--plot: cannot write {}", script_path));
  }
  int rc = std::system(fmt::format("gnuplot '{}' 2>'{}'", script_path, err_path).c_str());
  std::ifstream ef(err_path);
  std::stringstream es;
  es << ef.rdbuf();
  std::string complaint = es.str();
  while (!complaint.empty() && (complaint.back() == '\n' || complaint.back() == ' ')) complaint.pop_back();
  struct stat st{};
  const bool drawn = rc == 0 && stat(out_path.c_str(), &st) == 0 && st.st_size > 0;
  Status result = Status::Ok();
  if (!drawn) {
    result = Internal(fmt::format("--plot: gnuplot could not draw {} (exit {}){}{}", png,
                                  WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, complaint.empty() ? "" : ": ", complaint));
  } else if (std::rename(out_path.c_str(), png.c_str()) != 0) {
    // Another file system: copy.
    std::ifstream in(out_path, std::ios::binary);
    std::ofstream out(png, std::ios::binary | std::ios::trunc);
    out << in.rdbuf();
    if (!out) result = Internal(fmt::format("--plot: cannot write {}", png));
  }
  unlink(script_path.c_str());
  unlink(err_path.c_str());
  unlink(out_path.c_str());
  rmdir(dir);
  return result;
}

bool DrawPlot(const std::string& png, const std::string& script) {
  if (png.empty()) return false;
  Status st = RunGnuplot(script, png);
  if (!st.ok()) {
    Print(stderr, "--plot {}: not drawn: {}\n", png, st.message());
    return false;
  }
  Print(stderr, "plot drawn to {}\n", png);
  return true;
}

}  // namespace gpumigrate::cli
