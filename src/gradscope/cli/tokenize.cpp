// `gradscope tokenize`: the ids of each input line, space-separated, one output line per
// input line, no BOS/EOS.
#include <fstream>
#include <iostream>
#include <sstream>

#include "gradscope/cli/commands.h"
#include "gradscope/core/env.h"
#include "gradscope/core/error.h"
#include "gradscope/core/files.h"
#include "gradscope/data/tokenizer.h"

namespace gradscope {
namespace {

struct TokenizeOptions {
  std::string tokenizer = "llama3";
  std::string file;
  bool decode = false;
};

void tokenize_stream(const Tokenizer& tok, std::istream& in, bool decode) {
  std::string line;
  fmt::memory_buffer out;
  while (std::getline(in, line)) {
    if (decode) {
      std::vector<int32_t> ids;
      std::istringstream words(line);
      std::string word;
      while (words >> word) {
        size_t pos = 0;
        long long id = -1;
        try {
          id = std::stoll(word, &pos);
        } catch (const std::exception&) {
          pos = 0;
        }
        check_usage(pos == word.size() && id >= 0 && id < tok.vocab_size(),
                    "cannot decode '" + word + "': not a token id of " + tok.name(),
                    fmt::format("ids are integers in [0, {})", tok.vocab_size()));
        ids.push_back(static_cast<int32_t>(id));
      }
      fmt::format_to(std::back_inserter(out), "{}\n", tok.decode(ids));
    } else {
      const auto ids = tok.encode(line);
      for (size_t i = 0; i < ids.size(); ++i) {
        if (i > 0) out.push_back(' ');
        fmt::format_to(std::back_inserter(out), "{}", ids[i]);
      }
      out.push_back('\n');
    }
    if (out.size() > (1 << 16)) {
      std::fwrite(out.data(), 1, out.size(), stdout);
      out.clear();
    }
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
}

}  // namespace

void add_tokenize_command(CLI::App& root, int& exit_code) {
  auto o = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = root.add_subcommand(
      "tokenize",
      "Print the token ids of each line of FILE (or standard input), space-separated, one\n"
      "output line per input line, without BOS/EOS. With --decode, turn ids back into text.\n"
      "Example: echo 'Hello world' | gradscope tokenize --tokenizer llama3");
  cmd->add_option("--tokenizer", o->tokenizer, "bytes, gpt2 or llama3")->capture_default_str();
  cmd->add_option("FILE", o->file, "Input text file (default: standard input)");
  cmd->add_flag("--decode", o->decode, "Read ids, print text");
  cmd->callback([o, &exit_code] {
    auto tok = make_tokenizer(o->tokenizer, data_dir());
    if (o->file.empty() || o->file == "-") {
      tokenize_stream(*tok, std::cin, o->decode);
    } else {
      check_input_file(o->file, "text file");
      std::ifstream in(o->file, std::ios::binary);
      check_usage(static_cast<bool>(in), "cannot read '" + o->file + "'",
                  "check the path and its permissions");
      tokenize_stream(*tok, in, o->decode);
    }
    exit_code = 0;
  });
}

}  // namespace gradscope
